"""The cache families driven for one pod: scope, restore, save and explain loops."""
