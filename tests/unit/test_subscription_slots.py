"""The event publisher's subscription slots (service/broker/subscriptions.py): bounded in all and per peer,
given back when a peer unsubscribes or leaves. Pure: no socket."""

from __future__ import annotations

from zfab.broker.subscriptions import MAX_PREFIX, SubscriptionSlots, Verdict


def test_one_peer_takes_its_share_and_leaves_the_rest_to_others() -> None:
    slots = SubscriptionSlots(total=20, per_peer=2)
    # Given one peer that asks for 1,200 prefixes
    verdicts = [slots.subscribe(b"hog.%d" % i, b"c1") for i in range(1200)]
    # Then it holds its share, the rest refused per peer
    assert verdicts[:2] == [Verdict.ACCEPTED] * 2 and set(verdicts[2:]) == {Verdict.PER_PEER}
    assert slots.count == 2 and slots.held[b"c1"] == 2
    # And another peer still gets a slot
    assert slots.subscribe(b"job.demo.", b"c2") is Verdict.ACCEPTED


def test_the_total_bound_holds_across_peers() -> None:
    slots = SubscriptionSlots(total=5, per_peer=2)
    got = [slots.subscribe(b"p.%d" % i, b"c%d" % (i // 2)) for i in range(8)]
    assert got.count(Verdict.ACCEPTED) == 5 and got[5:] == [Verdict.TOO_MANY] * 3
    assert slots.subscribe(b"x" * (MAX_PREFIX + 1), b"new") is Verdict.TOO_LONG


def test_a_prefix_held_again_takes_no_second_slot() -> None:
    slots = SubscriptionSlots(total=5, per_peer=1)
    assert slots.subscribe(b"job.", b"key-a") is Verdict.ACCEPTED
    # the same peer again (a second connection of one CURVE key): its pipe subscribes, no new slot
    assert slots.subscribe(b"job.", b"key-a") is Verdict.HELD and Verdict.HELD.subscribes
    assert slots.count == 1
    # two peers may hold one prefix: a slot each
    assert slots.subscribe(b"job.", b"key-b") is Verdict.ACCEPTED and slots.count == 2


def test_slots_come_back_when_a_peer_unsubscribes_or_leaves() -> None:
    slots = SubscriptionSlots(total=10, per_peer=3)
    for peer in (b"c1", b"c2"):
        slots.subscribe(b"shared.", peer)
    slots.subscribe(b"own.", b"c1")
    # a peer's own UNSUBSCRIBE: its pipe is unsubscribed, its slot freed, nobody else's
    assert slots.unsubscribe(b"own.", b"c1") is True and slots.count == 2
    assert slots.unsubscribe(b"own.", b"c1") is False  # (not held: nothing to do)
    assert slots.unsubscribe(b"shared.", b"c9") is False and slots.count == 2  # another peer's prefix: not its own
    # libzmq's own unsubscription (no peer named) once no pipe holds a prefix: every holder lets it go
    assert slots.unsubscribe(b"shared.", None) is False
    assert slots.count == 0 and not slots.held and slots.prefixes() == []
