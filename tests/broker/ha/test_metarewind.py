"""Undoing a cut tail's metadata changes (issue 17): ``metarewind.plan`` against a model.

The model applies a history of changes as the managers do (values to set; a drop removes the
matching offsets). For any history cut anywhere: the state after the whole history, with the
plan for the cut part carried out, equals the state after the kept part alone."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.bodies import SubscriptionGroupConfig
from tidemq.broker.ha.metadata import (
    Change,
    DelayProgress,
    GroupDeleted,
    GroupSet,
    OffsetEntry,
    OffsetsCommitted,
    OffsetsDropped,
    TopicDeleted,
    TopicSet,
    TransactionProgress,
)
from tidemq.broker.ha.metarewind import Plan, plan
from tidemq.broker.topics import TopicConfig

LEVELS = (1, 2)
NAMES = st.sampled_from(["a", "b", "c"])


@dataclass
class Model:
    topics: dict[str, TopicConfig] = field(default_factory=dict)
    groups: dict[str, SubscriptionGroupConfig] = field(default_factory=dict)
    offsets: dict[tuple[str, str, int], int] = field(default_factory=dict)
    delay: tuple[tuple[tuple[int, int], ...], int] = (tuple((lv, 0) for lv in LEVELS), 0)
    tx: tuple[int, int] = (0, 0)

    def apply(self, c: Change) -> None:
        if isinstance(c, TopicSet):
            self.topics[c.config.topic_name] = c.config
        elif isinstance(c, TopicDeleted):
            self.topics.pop(c.name, None)
        elif isinstance(c, GroupSet):
            self.groups[c.config.group_name] = c.config
        elif isinstance(c, GroupDeleted):
            self.groups.pop(c.name, None)
        elif isinstance(c, OffsetsCommitted):
            for e in c.entries:
                self.offsets[e.group, e.topic, e.queue_id] = e.offset
        elif isinstance(c, OffsetsDropped):
            for k in [k for k in self.offsets if (c.topic in (None, k[1])) and (c.group in (None, k[0]))]:
                del self.offsets[k]
        elif isinstance(c, DelayProgress):
            self.delay = (c.levels, c.timer)
        else:
            self.tx = (c.half, c.op)

    def carry_out(self, p: Plan) -> None:
        for into, values in ((self.topics, p.topics), (self.groups, p.groups), (self.offsets, p.offsets)):
            for k, v in values.items():
                if v is None:
                    into.pop(k, None)  # type: ignore[attr-defined]
                else:
                    into[k] = v  # type: ignore[index]
        if p.delay is not None:
            self.delay = (p.delay.levels, p.delay.timer)
        if p.transactions is not None:
            self.tx = (p.transactions.half, p.transactions.op)


def state(history: list[Change]) -> Model:
    m = Model()
    for c in history:
        m.apply(c)
    return m


changes = st.one_of(
    st.builds(lambda n, q: TopicSet(TopicConfig(n, q, q, 6)), NAMES, st.integers(1, 3)),
    st.builds(TopicDeleted, NAMES),
    st.builds(lambda n, r: GroupSet(SubscriptionGroupConfig(n, retry_max_times=r)), NAMES, st.integers(0, 2)),
    st.builds(GroupDeleted, NAMES),
    st.builds(lambda es: OffsetsCommitted(tuple(OffsetEntry(g, t, q, o) for g, t, q, o in es)),
              st.lists(st.tuples(NAMES, NAMES, st.integers(0, 1), st.integers(0, 9)), min_size=1, max_size=3)),
    st.builds(OffsetsDropped, st.none() | NAMES, st.none() | NAMES),
    st.builds(lambda a, b, t: DelayProgress(((1, a), (2, b)), t), st.integers(0, 9), st.integers(0, 9),
              st.integers(0, 9)),
    st.builds(TransactionProgress, st.integers(0, 9), st.integers(0, 9)),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(changes, max_size=14), st.data())
def test_undoing_a_cut_tail_gives_the_state_of_the_kept_log(history: list[Change], data: st.DataObject) -> None:
    cut_at = data.draw(st.integers(0, len(history)))
    kept, cut = history[:cut_at], history[cut_at:]
    after = state(history)
    p = plan(cut, kept, complete=True, delay_levels=LEVELS)
    after.carry_out(p)
    assert after == state(kept)
    assert not p.unknown


def test_with_part_of_the_history_gone_unnamed_keys_are_kept_and_reported() -> None:
    kept = [TopicSet(TopicConfig("a", 1, 1, 6)), OffsetsCommitted((OffsetEntry("g", "a", 0, 4),))]
    cut = [TopicSet(TopicConfig("a", 8, 8, 6)), TopicSet(TopicConfig("b", 1, 1, 6)), GroupSet(SubscriptionGroupConfig("g")),
           OffsetsCommitted((OffsetEntry("g", "a", 0, 9), OffsetEntry("g", "b", 0, 1))), OffsetsDropped(None, "h"),
           DelayProgress(((1, 3),), 2)]
    p = plan(cut, kept, complete=False, delay_levels=(1,))
    assert p.topics == {"a": TopicConfig("a", 1, 1, 6)}  # named by a kept record: set back
    assert p.offsets == {("g", "a", 0): 4}
    assert not p.groups and p.delay is None
    assert p.unknown == ["topic b", "subscription group g", "offset of group g on b queue 0",
                         "offsets removed in the cut tail that no kept record names (topic=None group=h)",
                         "delay progress"]


def test_a_topic_deleted_in_the_cut_tail_is_set_again_and_reported() -> None:
    tc = TopicConfig("a", 2, 2, 6)
    p = plan([TopicDeleted("a"), OffsetsDropped("a", None)],
             [TopicSet(tc), OffsetsCommitted((OffsetEntry("g", "a", 1, 5), OffsetEntry("g", "z", 1, 6)))], complete=True)
    assert p.topics == {"a": tc} and p.restored_topics == ("a",)
    assert p.offsets == {("g", "a", 1): 5}  # the dropped offsets come back; the others are not touched
    assert not plan([], [TopicSet(tc)], complete=True)
