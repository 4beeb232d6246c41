import unittest

from greet import greet


class GreetTest(unittest.TestCase):
    def test_greets_by_name(self) -> None:
        self.assertEqual(greet("crab"), "Hello, crab!")


if __name__ == "__main__":
    unittest.main()
