"""Seed 003's components and seed 001's terminals on the Python SDK (examples/python-seeds), as
one application under the real agent: `toa-agent compose` with the embedded default, through the
SDK's stage.

    python3 -m unittest discover -s sdk/python/tests

The agent binary: $TOA_AGENT_BIN, else the workspace's debug build ($CARGO_TARGET_DIR or target).
"""

import concurrent.futures
import json
import os
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent.parent
SEEDS = ROOT / "examples" / "python-seeds"
sys.path.insert(0, str(HERE.parent))

from toa import CallError, Error  # noqa: E402
from toa.stage import compose  # noqa: E402

# The composition alone (a local run otherwise joins the other processes of its application on
# this machine: agent/src/coordination/group).
os.environ.setdefault("TOA_ALONE", "true")

# The process's name, as the seed's `TOA_INSTANCE=till-7 npx toa compose ./components/terminals`.
INSTANCE = "till-7"


def agent_binary():
    if os.environ.get("TOA_AGENT_BIN"):
        return os.environ["TOA_AGENT_BIN"]
    target = Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target")
    return str(target / "debug" / "toa-agent")


def at_once(count, call):
    """`call()` made `count` times at the same time: the answers, an exception as it was raised."""
    with concurrent.futures.ThreadPoolExecutor(count) as pool:
        futures = [pool.submit(call) for _ in range(count)]
        return [future.exception() or future.result() for future in futures]


class Shop(unittest.TestCase):
    """The whole application in one composition; each test on objects of its own."""

    @classmethod
    def setUpClass(cls):
        cls.bookings = Path(tempfile.mkdtemp(prefix="toa-sdk-seeds-")) / "bookings"
        components = sorted((SEEDS / "components").iterdir())
        env = {"BOOKINGS": str(cls.bookings), "TOA_INSTANCE": INSTANCE}
        cls.stage = compose([str(c) for c in components], context=SEEDS / "context.toa.yaml", env=env,
                            agent=agent_binary())

    @classmethod
    def tearDownClass(cls):
        cls.stage.stop()

    def call(self, target, request):
        return self.stage.call(target, request)

    def test_two_reservations_of_the_last_unit_at_once_sell_it_once(self):
        """Seed 003's Try it: one unit in stock, two reservations of it at the same time."""
        kettle = {"id": "c0ffee00c0ffee00c0ffee00c0ffee00"}
        stocked = self.call("fulfilment.stock.transit", {"query": kettle, "input": {"available": 1}})
        self.assertEqual(stocked, {**kettle, "available": 1, "VERSION": 1})
        answers = at_once(2, lambda: self.call("fulfilment.stock.reserve",
                                               {"query": kettle, "input": {"quantity": 1}}))
        sold = [answer for answer in answers if not isinstance(answer, Exception)]
        refused = [answer for answer in answers if isinstance(answer, Exception)]
        self.assertEqual(sold, [{**kettle, "available": 0, "VERSION": 2}], answers)
        self.assertEqual([type(error) for error in refused], [Error], answers)
        self.assertEqual(refused[0].code, "OUT_OF_STOCK")
        self.assertEqual(self.call("fulfilment.stock.observe", {"query": kettle}),
                         {**kettle, "available": 0, "VERSION": 2})

    def test_approve_takes_the_money_once_and_a_second_approval_writes_nothing(self):
        """Seed 003's What a second run repeats: the debit keyed by the order."""
        wallet = {"id": "approve-c1"}
        self.call("billing.wallets.transit", {"query": wallet, "input": {"balance": 100}})
        order = self.call("store.orders.transit",
                          {"input": {"status": "pending", "customer": wallet["id"], "total": 30}})
        self.assertRegex(order["id"], r"^[0-9a-f]{32}$", "a new order gets an id of its own")
        self.assertEqual(order["VERSION"], 1)
        approved = self.call("store.orders.approve", {"query": {"id": order["id"]}})
        self.assertEqual((approved["status"], approved["VERSION"]), ("approved", 2), approved)
        paid = {"balance": 70, "paid": {order["id"]: 30}, "VERSION": 2}
        self.assertEqual(self.call("billing.wallets.observe", {"query": wallet}), {**wallet, **paid})
        # Asked again: DISCARD answers the order as it is, without a write, and debits nothing.
        again = self.call("store.orders.approve", {"query": {"id": order["id"]}})
        self.assertEqual((again["status"], again["VERSION"]), ("approved", 2), again)
        stored = self.call("store.orders.observe", {"query": {"id": order["id"]}})
        self.assertEqual((stored["status"], stored["VERSION"]), ("approved", 2), "not written again")
        self.assertEqual(self.call("billing.wallets.observe", {"query": wallet}), {**wallet, **paid})
        # The wallet's own repeat for the same order: the balance answered, nothing taken.
        debit = {"query": wallet, "input": {"amount": 30, "ref": order["id"]}}
        self.assertEqual(self.call("billing.wallets.debit", debit), {"balance": 70})
        self.assertEqual(self.call("billing.wallets.observe", {"query": wallet}), {**wallet, **paid})

    def test_approve_without_the_money_answers_the_wallets_error_and_stores_nothing(self):
        wallet = {"id": "approve-c2"}
        self.call("billing.wallets.transit", {"query": wallet, "input": {"balance": 10}})
        order = self.call("store.orders.transit",
                          {"input": {"status": "pending", "customer": wallet["id"], "total": 30}})
        refused = self.call("store.orders.approve", {"query": {"id": order["id"]}})
        self.assertIsInstance(refused, Error, refused)
        self.assertEqual(refused.code, "INSUFFICIENT_FUNDS")
        self.assertEqual(self.call("store.orders.observe", {"query": {"id": order["id"]}}), order)
        self.assertEqual(self.call("billing.wallets.observe", {"query": wallet}),
                         {**wallet, "balance": 10, "paid": {}, "VERSION": 1})

    def test_two_bookings_of_one_order_at_once_reach_the_carrier_once(self):
        """Seed 003's When a lock is the answer: the shipment read again under the lock."""
        answers = at_once(2, lambda: self.call("fulfilment.shipments.book", {"input": {"order": "o1"}}))
        self.assertEqual(answers, [{"id": "o1", "booking": "parcel-o1", "VERSION": 1}] * 2)
        booked = [json.loads(line) for line in self.bookings.read_text().splitlines()]
        self.assertEqual(booked, [{"order": "o1", "instance": INSTANCE}], "the carrier was asked once")
        self.assertEqual(self.call("fulfilment.shipments.observe", {"query": {"id": "o1"}}),
                         {"id": "o1", "booking": "parcel-o1", "VERSION": 1})

    def test_connect_records_the_holder_and_charge_runs_on_it(self):
        """Seed 001's terminals: the holder assigned by connect, the charge on that process."""
        self.assertIsNone(self.call("terminals.connect", {"input": {"terminal": "t1", "address": "till-a"}}))
        terminal = self.call("terminals.observe", {"query": {"id": "t1"}})
        self.assertEqual(terminal, {"id": "t1", "holder": INSTANCE, "VERSION": 1})
        charged = self.call("terminals.charge", {"input": {"terminal": "t1", "amount": 5},
                                                 "instance": terminal["holder"]})
        self.assertEqual(charged, {"charged": 5})
        unheld = self.call("terminals.charge", {"input": {"terminal": "t9", "amount": 5}, "instance": INSTANCE})
        self.assertIsInstance(unheld, Error, unheld)
        self.assertEqual(unheld.code, "NOT_HELD", "a terminal this process never connected")
        with self.assertRaises(CallError) as refused:
            self.call("terminals.charge", {"input": {"terminal": "t1", "amount": 5}})
        self.assertEqual(refused.exception.code, 202, "a stateful call that names no process: RequestContract")


if __name__ == "__main__":
    unittest.main()
