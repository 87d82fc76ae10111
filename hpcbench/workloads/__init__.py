"""What is trained: the framework-neutral model zoo (zoo.py) and the datasets (datasets.py)."""
