# What the seed leaves to the reader: the terminal's driver (`open`). An address `slow:MS`
# answers a charge after MS.
import time


class Connection:
    def __init__(self, address):
        self.delay = int(address[5:]) / 1000 if address.startswith("slow:") else 0

    def charge(self, amount):
        time.sleep(self.delay)
        return {"charged": amount}

    def close(self):
        pass


def open(address):
    return Connection(address)
