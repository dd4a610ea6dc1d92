"""runtime/views.py: what a pod in its own view makes of a LIST without the summary."""

from __future__ import annotations

import asyncio

import pytest

from agent.runtime.views import journal_if_summary_gone, summary_gone

COLLECTION = "/api/v1/namespaces/default/configmaps"


class Api:
    """Answers the metadata LISTs by name from ``present``, and records them."""

    def __init__(self, present: set[str]) -> None:
        self.present, self.asked = present, []

    async def list_objects(self, collection, *, field_selector="", metadata_only=False):  # type: ignore[no-untyped-def]
        name = field_selector.removeprefix("metadata.name=")
        self.asked.append((name, metadata_only))
        return ([{"metadata": {"name": name}}] if name in self.present else []), "9"


@pytest.mark.parametrize(("present", "gone"), [
    (set(), False),  # nothing published yet: wait
    ({"demo-topology-journal"}, True),  # the journal without the summary: deleted
    ({"demo-topology-journal", "demo-topology-summary"}, False),  # published between the two LISTs
])
def test_a_summary_published_between_the_two_lists_is_not_taken_for_deleted(present, gone):
    api = Api(present)
    looked = asyncio.run(journal_if_summary_gone(api, COLLECTION, "demo-topology", []))
    assert (summary_gone(looked, "demo-topology") is not None) == gone
    assert all(metadata_only for _, metadata_only in api.asked)  # names only, never the journal's changes


def test_a_listed_summary_asks_nothing_more():
    api = Api(set())
    assert asyncio.run(journal_if_summary_gone(api, COLLECTION, "demo-topology",
                                               [{"metadata": {"name": "demo-topology-summary"}}])) == []
    assert api.asked == []
