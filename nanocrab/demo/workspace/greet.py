"""Greetings for the crab service."""


def greet(name: str) -> str:
    return "Hello " + name
