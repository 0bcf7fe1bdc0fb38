"""`zerodoctor lint`: judge a training setup's configs with rules (one module each, in `lint/rules`)."""
