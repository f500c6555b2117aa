"""The local registry: the store and its collaborators, generations, recovery, locks on the
store, imports, hosts."""
