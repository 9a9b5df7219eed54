"""Demo datasets, split the way a federation would see them."""
