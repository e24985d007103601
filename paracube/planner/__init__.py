"""The planner: enumerate, check and rank layouts (search.py)."""

from paracube.planner.search import SearchResult, search

__all__ = ["SearchResult", "search"]
