"""kgrade's item bank: the course quizzes and coding exercises, kept as data."""

from item_bank.bank import UnknownQuiz, all_quizzes, check_bank, get_quiz, quiz_ids
from item_bank.model import LANG_MODES, LANGUAGES, Item, Option, Quiz, Settings, Text
from item_bank.schema import BankError, dump_quiz, load_quiz

__all__ = [
    "LANG_MODES",
    "LANGUAGES",
    "BankError",
    "Item",
    "Option",
    "Quiz",
    "Settings",
    "Text",
    "UnknownQuiz",
    "all_quizzes",
    "check_bank",
    "dump_quiz",
    "get_quiz",
    "load_quiz",
    "quiz_ids",
]
