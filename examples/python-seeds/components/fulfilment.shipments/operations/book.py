# components/fulfilment.shipments/operations/book.py
from stand_ins import book


def effect(input, context):
    def booking(signal):
        shipment = context.local.observe({"query": {"id": input["order"]}})

        if shipment.get("booking") is not None:
            return shipment  # whoever held the lock before did it

        booking = book(shipment, context)

        return context.local.assign({"query": {"id": input["order"]}, "input": {"booking": booking}})

    return context.atom.lock(f"booking:{input['order']}", booking)
