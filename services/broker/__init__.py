"""The TideMQ broker (imported as tidemq.broker)."""
