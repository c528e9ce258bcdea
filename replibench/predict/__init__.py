"""Predicting time to target on hardware that is not here: statistical x hardware efficiency."""
