"""specreg.registry"""
