"""Training of the bundled model organism (``basm-probes organism train``)."""
