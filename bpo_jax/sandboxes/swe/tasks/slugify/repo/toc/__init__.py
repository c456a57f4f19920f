from toc.slug import slugify, unique_slugs
from toc.build import table_of_contents
