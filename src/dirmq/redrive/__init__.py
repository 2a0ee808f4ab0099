"""Redrive tasks: dead messages moved back in the background, paced, watched, cancelled and
resumed after a crash by whichever process serves the root next (tasks.py, records.py)."""
