from caldays.leap import is_leap
from caldays.dates import day_of_year, days_between, days_in_month
