from csvlite.split import split_line
from csvlite.table import read_table
