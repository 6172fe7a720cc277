"""bench_parallel.py's workloads: the long-answer prompts of the throughput test and the
conversations of the prefix-cache test (a long per-session system prompt, two users)."""

from __future__ import annotations

STORY_PROMPTS = [
    "Write a long, detailed story about a lighthouse keeper who finds a message in a bottle. "
    "Describe every character, the weather and the sea at length.",
    "Explain in great detail, step by step, how a steam locomotive works, from the firebox to "
    "the wheels, with examples and a short history.",
    "Write a long travel diary of a week spent walking through the mountains of a country you "
    "choose. Describe each day in detail: food, people, paths and weather.",
    "Give a long and thorough lecture on the water cycle for a class of curious students, with "
    "many examples, questions to the class and their answers.",
    "Write a long fairy tale about a fox, a clockmaker and a snowy town, with dialogue.",
    "Describe in detail how to bake bread at home, every step, every mistake to avoid.",
    "Tell the long history of a fictional library across five centuries.",
    "Write a long letter from a sailor to his family describing a voyage around the world.",
]


def tools_list(topic: str, n: int) -> str:
    """``n`` made-up tool descriptions (JSON-like), about ``topic``."""
    verbs = ["search", "get", "create", "update", "delete", "list", "summarize", "translate",
             "schedule", "compare", "export", "validate"]  # fmt: skip
    things = ["order", "invoice", "customer", "ticket", "shipment", "product", "review",
              "payment", "report", "meeting", "document", "warehouse", "route",
              "refund"]  # fmt: skip
    out = []
    for i in range(n):
        v, t = verbs[i % len(verbs)], things[(i * 5 + len(topic)) % len(things)]
        out.append(
            f'{{"name": "{v}_{t}_{i}", "description": "{v.capitalize()} a {t} of the {topic} '
            f'system. Use it when the user asks to {v} a {t}; never guess identifiers.", '
            f'"parameters": {{"type": "object", "properties": {{"{t}_id": {{"type": "string", '
            f'"description": "the {t} identifier"}}, "limit": {{"type": "integer", "minimum": 1, '
            f'"maximum": {10 + i}}}, "verbose": {{"type": "boolean"}}}}, "required": ["{t}_id"]}}}}'
        )
    return "\n".join(out)


def system_prompt(session: str, topic: str, tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens (SmolLM2's tokenizer: ~115 tokens a tool),
    opening with ``session`` so that each repeat's prompts share nothing with the previous."""
    head = (
        f"Session {session}. You are the assistant of the {topic} help desk. Answer briefly and "
        f"politely. You can call the following tools by answering with a JSON object "
        f'{{"tool": NAME, "arguments": {{...}}}}; call one only when it is needed.\nTools:\n'
    )
    return head + tools_list(topic, max(1, round((tokens - 60) / 115)))


def conversations(session: str, sys_tokens: int) -> dict[str, list[dict]]:
    """The cache test's messages: A's first turn, B's turn, A's second turn (without the
    assistant's answer, filled in after A's first turn)."""
    a_sys = system_prompt(session, "online bookshop", sys_tokens)
    b_sys = system_prompt(session, "city bicycle rental", sys_tokens)
    return {
        "A1": [
            {"role": "system", "content": a_sys},
            {"role": "user", "content": "Hello! What kinds of things can you help me with?"},
        ],
        "B": [
            {"role": "system", "content": b_sys},
            {"role": "user", "content": "Hi, how do I rent a bicycle for the weekend?"},
        ],
        "A2": [{"role": "user", "content": "Thanks. Which tool would you use to find order 42?"}],
    }


def user(prompt: str) -> list[dict]:
    return [{"role": "user", "content": prompt}]
