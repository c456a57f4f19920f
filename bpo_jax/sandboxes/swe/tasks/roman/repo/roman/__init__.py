from roman.convert import from_roman, to_roman
from roman.validate import is_canonical
