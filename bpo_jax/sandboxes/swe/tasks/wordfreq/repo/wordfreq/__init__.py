from wordfreq.count import count_words, tokenize
from wordfreq.report import top_words, format_report
