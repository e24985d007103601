"""The `paracube` command line."""
