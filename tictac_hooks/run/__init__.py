"""The run engine: what a TicTac run decides, apart from the framework that drives it.

sequential.py  the order check's decision rule (a sequential one-sided t test)
"""
