"""The stock: items with quantities and unit prices."""

from dataclasses import dataclass, field

from inventory.pricing import round_price


@dataclass
class Item:
    sku: str
    name: str
    quantity: int
    unit_price: float


@dataclass
class Store:
    items: dict[str, Item] = field(default_factory=dict)

    def add(self, item: Item) -> None:
        if item.sku in self.items:
            self.items[item.sku].quantity += item.quantity
        else:
            self.items[item.sku] = item

    def remove(self, sku: str, quantity: int) -> None:
        item = self.items[sku]
        if quantity > item.quantity:
            raise ValueError(f"only {item.quantity} of {sku} in stock")
        item.quantity -= quantity

    def value(self) -> float:
        return round_price(sum(i.quantity * i.unit_price for i in self.items.values()))
