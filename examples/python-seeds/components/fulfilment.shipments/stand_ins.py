# What the seed leaves to the reader: booking the carrier. Each booking is appended to $BOOKINGS
# (when set), so that a test can count them; it takes 200 ms, as a call to a carrier would.
import json
import os
import time


def book(shipment, context):
    time.sleep(0.2)
    if os.environ.get("BOOKINGS"):
        with open(os.environ["BOOKINGS"], "a") as bookings:
            bookings.write(json.dumps({"order": shipment["id"], "instance": context.instance}) + "\n")
    return f"parcel-{shipment['id']}"
