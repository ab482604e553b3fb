"""Many measurements chosen for a purpose: the exhaustive sweep, Ray hosts, and tune's
measure-until-confirmed search.

Imports quality, runner and every part below it.
"""
