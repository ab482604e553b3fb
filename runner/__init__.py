"""specreg.runner"""
