"""Reactors: each consumes some event types and returns the events it emits."""
