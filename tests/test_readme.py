"""README says what a new user needs (issue 32, item 7): what `·` means, once, where the tour first shows a
token, and how long the test suite takes on a 2-core machine."""

from __future__ import annotations

import re
from pathlib import Path

README = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")


def test_the_leading_space_dot_is_explained_once_where_the_tour_first_shows_a_token():
    tour = README[README.index("## A tour"):]
    first = tour.index("·")  # the first token the tour shows
    explained = [m.start() for m in re.finditer(r"`·` is a leading space", tour)]
    assert len(explained) == 1
    # between the first token shown and the explanation there is at most the rest of that code block
    assert tour.count("```", first, explained[0]) == 1


def test_the_test_suite_duration_on_two_cores_is_given():
    assert re.search(r"suite \(about \d+ tests\) takes about \d+ minutes on a 2-core machine", README)
