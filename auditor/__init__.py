"""specreg.auditor"""
