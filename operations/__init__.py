"""twinbolt's layers: one module per layer (states, driver, link, serving, gateway, verify)."""
