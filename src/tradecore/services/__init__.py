"""Use cases: each orchestrates ports to carry out one flow of the specification."""
