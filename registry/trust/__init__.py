"""Keys, signatures and what a process trusts."""
