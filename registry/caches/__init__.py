"""One cache folder's files by content: Triton's compile cache, Inductor's and declared
folders."""
