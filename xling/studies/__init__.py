"""Studies: one package per paper, behind one interface (`base.Study`).

Only `base`, `registry` and `tables` are for code outside this folder; a study package is
reached through the registry by its name, never imported by jobs/, core/ or the CLI.
"""
