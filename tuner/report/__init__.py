"""Reports from the store: markdown tables of best configs against the incumbent and comparators."""
