"""The auto-tuner loop: run the top plans, log what they measured, learn from it."""
