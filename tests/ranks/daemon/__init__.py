"""The real daemon against real ranks: hangs ended, healthy jobs left alone, its faults."""
