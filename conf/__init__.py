# Makes conf/ importable as imgcls.conf for Hydra (the package links to it).
