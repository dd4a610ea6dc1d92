"""One pod object: its fields read through one interface, checked, its containers, accelerators and claims, where it is
placed and whether it is lost."""
