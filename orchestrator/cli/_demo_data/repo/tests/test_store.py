from inventory.store import Item, Store


def test_value_rounds_half_up():
    store = Store()
    store.add(Item("a", "apple", 3, 0.335))
    assert store.value() == 1.01


def test_remove_too_many():
    store = Store()
    store.add(Item("a", "apple", 1, 1.0))
    try:
        store.remove("a", 2)
    except ValueError:
        pass
    else:
        raise AssertionError("expected ValueError")
