from stats.center import mean, median
from stats.spread import describe, iqr
