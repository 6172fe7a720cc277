"""The task texts of bench_speculative.py: chat requests whose answers copy the prompt (a Python
file to rewrite with one rename, a JSON object that repeats the fields of a message) and one
whose answer copies nothing (a story from a one-line prompt). Written for this benchmark."""

from __future__ import annotations

#: A small Python module (about 400 tokens) in which ``shelf_code`` is to be renamed.
RENAME_SOURCE = '''\
"""Track the stock of a small seed library: packets come in, go out and expire."""

from dataclasses import dataclass, field
from datetime import date, timedelta


@dataclass
class Packet:
    species: str
    shelf_code: str
    harvested: date
    count: int = 1
    notes: list[str] = field(default_factory=list)

    def expires(self, years: int = 3) -> date:
        return self.harvested + timedelta(days=365 * years)


class SeedLibrary:
    def __init__(self) -> None:
        self.packets: dict[str, list[Packet]] = {}

    def add(self, packet: Packet) -> None:
        shelf_code = packet.shelf_code.strip().upper()
        self.packets.setdefault(shelf_code, []).append(packet)

    def lend(self, species: str, shelf_code: str) -> Packet | None:
        for packet in self.packets.get(shelf_code, []):
            if packet.species == species and packet.count > 0:
                packet.count -= 1
                return packet
        return None

    def expired(self, today: date) -> list[tuple[str, Packet]]:
        found = []
        for shelf_code, packets in sorted(self.packets.items()):
            for packet in packets:
                if packet.expires() < today:
                    found.append((shelf_code, packet))
        return found

    def report(self, today: date) -> str:
        lines = []
        for shelf_code, packets in sorted(self.packets.items()):
            total = sum(p.count for p in packets)
            lines.append(f"{shelf_code}: {total} packets")
        stale = len(self.expired(today))
        lines.append(f"expired: {stale}")
        return "\\n".join(lines)
'''

#: The file first, the request after it: SmolLM2-135M copies the file far more faithfully so
#: (a most-recent-bigram lookup predicted 78 % of its greedy output tokens, against 47 % with the
#: request first, where it mostly writes new code).
RENAME_ASK = (
    "```python\n" + RENAME_SOURCE + "```\n\n"
    "Rename the variable `shelf_code` to `drawer_label` everywhere in this Python file. "
    "Change nothing else and output the whole file."
)

#: A message whose facts the answer repeats as JSON.
JSON_INPUT = """\
Hello, this is Margarethe Oyelaran-Fitzgerald writing about order number WX-55821-K, placed
on 14 March. Please ship it to 27 Larkspur Terrace, Flat 3B, Hebden Bridge, HX7 8QL, United
Kingdom. You can reach me at m.oyelaran.fitz@example.org or on +44 7700 900312. The order was
two packs of Meadow Blend wildflower seeds (SKU MB-220), one Copper Rain Gauge (SKU CRG-09) and
three Bamboo Plant Markers, set of twenty (SKU BPM-20). The parcel should be left with the
neighbour at number 25 if nobody answers, and please do not fold the seed packets."""

#: The message first, the request after it (as RENAME_ASK).
JSON_ASK = (
    "Message:\n" + JSON_INPUT + "\n\nAnswer with one JSON object only, with the keys "
    '"customer_name", "email", "phone", "order_id", "order_date", "shipping_address" (an object '
    'with "line1", "line2", "town", "postcode", "country"), "items" (a list of objects with '
    '"sku", "name", "quantity") and "delivery_notes". Copy every value exactly as written in '
    "the message."
)

STORY_ASK = "Write a long story about a lighthouse keeper who finds a map in a bottle."

#: name -> (chat messages, default tokens, kind); kind "copy" or "prose".
TASKS = {
    "rename": ([{"role": "user", "content": RENAME_ASK}], 256, "copy"),
    "json": ([{"role": "user", "content": JSON_ASK}], 128, "copy"),
    "story": ([{"role": "user", "content": STORY_ASK}], 256, "prose"),
}
