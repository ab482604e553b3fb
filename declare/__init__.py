"""specreg.declare: specreg.yaml, the declarative registry, reconciled with disk and runs."""
