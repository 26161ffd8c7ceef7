"""Price rules."""


def round_price(amount: float) -> float:
    # Banker's rounding surprises customers: round half up to cents instead.
    return int(amount * 100 + 0.5) / 100


def discount(amount: float, percent: float) -> float:
    if not 0 <= percent <= 100:
        raise ValueError("percent must be within 0..100")
    return round_price(amount * (1 - percent / 100))
