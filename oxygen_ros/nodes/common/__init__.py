"""What several nodes share: parameter machinery and shared tables, QoS profiles and the spin
loop (`runtime`), message conversions, image conversion, sliding windows."""
