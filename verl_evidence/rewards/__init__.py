"""Pure reward functions: strings and numbers in, numbers out.

Nothing here imports verl, torch or ray, so the formulas can be read, tested and
reused on their own (like TRL's reward functions).
"""
