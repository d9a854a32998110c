"""Text, HTML, plots and widgets for every result. text.py is the reference rendering."""
