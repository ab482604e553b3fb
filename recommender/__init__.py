"""specreg.recommender"""
