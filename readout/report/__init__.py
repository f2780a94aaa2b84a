"""The report a reader of the scores sees: text and markdown tables (tables.py, what
the CLI prints), and the `report` command's page (page.py) with its figures: the data
each figure plots (figure_data.py, pure Python) and the drawing (figures.py,
matplotlib, imported only when a figure is drawn)."""
