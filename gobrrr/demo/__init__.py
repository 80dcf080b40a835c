"""`make demo` / `gobrrr demo`: one step per part of the series (tour.py), Parts 5 and 6 on ranks (zero.py, tp.py)."""
from gobrrr.demo.tour import main

__all__ = ["main"]
