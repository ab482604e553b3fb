"""specreg.reports"""
