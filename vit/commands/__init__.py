"""The commands: one ``main(argv)`` per console script (vit-train, vit-classify, ...), which scripts/*.py call."""
