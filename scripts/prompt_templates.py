"""The templated part of the head's seed prompts (assets/prompts/train_templated.jsonl).

The 341 hand-written prompts in train.jsonl are too few for a draft head to generalise (train
top-1 0.78 against held-out 0.33): the head is data-limited. Templates x subjects give a
thousand more varied requests in the same eleven categories, cheaply and reproducibly:

    python -m scripts.prompt_templates --n 1200 --out assets/prompts/train_templated.jsonl
    python -m scripts.prompt_templates --n 800 --seed 1 --first-id 20001 \
        --exclude assets/prompts/heldout.jsonl,assets/prompts/train.jsonl,assets/prompts/train_templated.jsonl \
        --out assets/prompts/train_templated2.jsonl

Ids start at 10001 (the second set at 20001) so they never collide with train.jsonl or heldout.jsonl.
"""
from __future__ import annotations

import argparse
import json
import random

TOPICS = [
    "the ocean", "a thunderstorm", "an old lighthouse", "city traffic", "a lost cat", "autumn leaves",
    "a first day at school", "a mountain village", "a late train", "a birthday party", "a quiet library",
    "a summer garden", "a robot learning to paint", "a desert at night", "a busy kitchen", "friendship",
    "moving to a new city", "a rainy Sunday", "the last day of summer", "a forgotten key", "a market in Marrakesh",
    "a spaceship crew", "a snowy forest", "a jazz club", "a bicycle ride", "an abandoned castle", "a violin",
    "grandmother's recipe", "the moon", "a marathon", "a small bakery", "a message in a bottle", "a power outage",
]
SUBJECTS = [
    "photosynthesis", "black holes", "the water cycle", "inflation", "vaccines", "plate tectonics",
    "the French Revolution", "supply and demand", "machine learning", "climate change", "the immune system",
    "compound interest", "the Roman Empire", "electric cars", "the printing press", "DNA replication",
    "the stock market", "renewable energy", "the Renaissance", "quantum computing", "gravity", "volcanoes",
    "the Industrial Revolution", "democracy", "antibiotics", "the internet", "sleep", "coral reefs",
    "the Cold War", "nuclear fusion", "blockchain", "the human heart", "evolution", "the Silk Road",
    "magnetism", "recycling", "the Great Depression", "earthquakes", "bees and pollination", "the speed of light",
    "the Big Bang", "tides", "rainbows", "the placebo effect", "cryptography", "the Moon landing",
    "the periodic table", "photosynthesis in algae", "ocean currents", "the greenhouse effect",
]
PEOPLE = ["a pirate captain", "a medieval knight", "a detective in 1920s London", "a friendly dragon",
          "a tour guide in Rome", "a grumpy wizard", "a space station commander", "a customer service agent",
          "a personal fitness coach", "a job interviewer at a tech company", "a Shakespearean actor",
          "a travel agent", "a museum curator", "a chef on a cooking show", "a sports commentator",
          "Sherlock Holmes", "a kind librarian", "a startup founder pitching an idea", "a ship's cook",
          "a mountain guide", "a time traveller from the year 3000", "a nervous first-time pilot"]
LANGS = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]
SENTENCES = [
    "Where is the nearest train station?", "I would like a cup of tea, please.", "The weather is lovely today.",
    "Could you help me carry this box?", "We are meeting at six o'clock.", "My brother works in a hospital.",
    "This book is more interesting than the film.", "Please close the window, it is cold.",
    "I have been learning to cook for two years.", "The museum opens at nine in the morning.",
    "Do you know a good restaurant near here?", "She forgot her umbrella on the bus.",
    "Thank you very much for your help.", "How much does this jacket cost?", "The children are playing in the park.",
]
CODE_TASKS = [
    "reverses a string", "checks whether a number is prime", "returns the n-th Fibonacci number",
    "counts the vowels in a string", "merges two sorted lists", "removes duplicates from a list while keeping order",
    "computes the factorial of n", "finds the largest element in a list", "checks whether a string is a palindrome",
    "flattens a nested list", "counts word frequencies in a text", "converts Celsius to Fahrenheit",
    "computes the greatest common divisor of two numbers", "sorts a list of dictionaries by a key",
    "reads a CSV file and returns the rows as dictionaries", "validates an email address with a regular expression",
    "implements binary search", "transposes a matrix", "returns the sum of the digits of a number",
    "groups a list of words by their first letter",
]
CODE_LANGS = ["Python", "Python", "Python", "JavaScript", "C", "Java", "Rust", "Go"]
NAMES = ["Alice Martin", "Bob Chen", "Carla Gomez", "David Okafor", "Elena Petrova", "Farid Haddad",
         "Grace Kim", "Hugo Schmidt", "Ines Rossi", "Jamal Wright", "Keiko Tanaka", "Liam O'Brien"]
CITIES = ["Lisbon", "Toronto", "Nairobi", "Osaka", "Berlin", "Austin", "Melbourne", "Lyon", "Seoul", "Cairo"]
ITEMS = ["laptops", "office chairs", "coffee beans", "bicycles", "printer paper", "desk lamps", "notebooks"]
CATEGORIES = ["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
              "humanities", "translation", "summarization", "qa"]
# category -> (probability of a second turn, its text or the texts to choose from)
FOLLOW_UPS = {
    "writing": (0.25, ["Now make it shorter.", "Rewrite it in a more formal tone.",
                       "Give it a title and explain your choice.", "Make it funnier."]),
    "roleplay": (0.3, ["What is the hardest part of your job?", "Tell me a secret nobody knows.",
                       "What would you do if you had a day off?"]),
    "math": (0.2, "Can you explain that more simply?"),
    "coding": (0.3, ["Add comments to the code.", "Write a unit test for it.", "What is its time complexity?"]),
}


def _passage(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    c1, c2 = r.sample(CITIES, 2)
    item = r.choice(ITEMS)
    n, price, day = r.randint(3, 400), r.randint(5, 900), r.randint(1, 28)
    month = r.choice(["January", "March", "May", "July", "September", "November"])
    return (f"On {month} {day}, {a} from the {c1} office ordered {n} {item} at ${price} each from a supplier "
            f"in {c2}. {b} approved the order the next day and asked for delivery within two weeks. "
            f"The supplier confirmed that shipping would cost an extra ${r.randint(20, 300)}.")


def _story(r: random.Random) -> str:
    a, b = r.sample(NAMES, 2)
    t = r.choice(TOPICS)
    return (f"{a.split()[0]} had always been curious about {t}. One morning, {a.split()[0]} and a friend, "
            f"{b.split()[0]}, decided to spend the whole day exploring it. They made mistakes, argued twice, "
            f"and laughed more than they expected. By evening they had learned something new about patience "
            f"and about each other, and they promised to do it again the following year.")


def make(r: random.Random) -> tuple[str, list[str]]:
    """One (category, turns) drawn from the templates."""
    cat = r.choice(CATEGORIES)
    t, s = r.choice(TOPICS), r.choice(SUBJECTS)
    if cat == "writing":
        turns = [r.choice([f"Write a short poem about {t}.", f"Write a haiku about {t}.",
                           f"Write a short story of about 150 words about {t}.",
                           f"Write a product description for a candle that smells like {t}.",
                           f"Write a friendly email inviting a colleague to a talk about {s}.",
                           f"Write the opening paragraph of a novel that begins with {t}.",
                           f"Write a limerick about {t}.", f"Write a blog post introduction about {s}."])]
    elif cat == "roleplay":
        p = r.choice(PEOPLE)
        turns = [r.choice([f"Pretend you are {p}. Introduce yourself.",
                           f"You are {p}. Describe your typical day.",
                           f"Act as {p} and give me advice about {t}.",
                           f"Role-play as {p} explaining {s} to a visitor."])]
    elif cat == "reasoning":
        a, b, c = r.sample(["Anna", "Ben", "Chloe", "Dan", "Eve", "Finn"], 3)
        x, y = r.randint(2, 9), r.randint(2, 9)
        turns = [r.choice([f"{a} is taller than {b}, and {b} is taller than {c}. Who is the shortest? Explain.",
                           f"If it takes {x} machines {x} minutes to make {x} widgets, how long would it take "
                           f"{y * 10} machines to make {y * 10} widgets?",
                           f"{a} has {x} apples and gives {b} {min(x, y)} of them. {b} then doubles what {b} has. "
                           f"How many apples does {b} have if {b} started with {y}?",
                           f"A farmer has {x + y} sheep and all but {x} run away. How many are left? Think step by step.",
                           f"Is the following argument valid? All cats are animals. {a}'s pet is an animal. "
                           f"Therefore {a}'s pet is a cat.",
                           f"What comes next in the sequence {x}, {2 * x}, {4 * x}, {8 * x}, ...? Explain the pattern."])]
    elif cat == "math":
        x, y, z = r.randint(2, 99), r.randint(2, 99), r.randint(2, 12)
        turns = [r.choice([f"What is {x} times {y}? Show your work.", f"Solve for x: {z}x + {x} = {y + x}.",
                           f"What is {z}% of {x * 10}?", f"Compute the area of a circle with radius {z}.",
                           f"A shirt costs ${x}. It is discounted by {z * 5}%. What is the new price?",
                           f"What is the sum of the integers from 1 to {x}?",
                           f"Simplify the fraction {x * z}/{y * z}.",
                           f"A train travels {x * 5} km in {z} hours. What is its average speed?",
                           f"Find the derivative of f(x) = {z}x^3 + {x}x.", f"Is {x * y + 1} a prime number?"])]
    elif cat == "coding":
        task, lang = r.choice(CODE_TASKS), r.choice(CODE_LANGS)
        turns = [r.choice([f"Write a {lang} function that {task}.",
                           f"How would you write a {lang} program that {task}? Include an example.",
                           f"Explain step by step how to write code that {task}."])]
    elif cat == "extraction":
        p = _passage(r)
        turns = [r.choice([f"Extract every name, city and amount of money from this text:\n{p}",
                           f"From the text below, list the people involved and their roles.\n{p}",
                           f"Return a JSON object with the fields date, item, quantity and unit_price from "
                           f"this text:\n{p}"])]
    elif cat == "stem":
        turns = [r.choice([f"Explain {s} in simple terms.", f"What are the main causes and effects of {s}?",
                           f"Explain {s} to a ten-year-old.", f"What is the science behind {s}?",
                           f"Give three surprising facts about {s}."])]
    elif cat == "humanities":
        turns = [r.choice([f"What was the historical significance of {s}?",
                           f"Discuss the ethical questions raised by {s}.",
                           f"How has {s} influenced modern society?",
                           f"Write a short essay on how art and literature have portrayed {t}."])]
    elif cat == "translation":
        sent, lang = r.choice(SENTENCES), r.choice(LANGS)
        turns = [r.choice([f"Translate into {lang}: \"{sent}\"",
                           f"How do you say \"{sent}\" in {lang}?",
                           f"Translate the following sentence to {lang} and explain any tricky words: {sent}"])]
    elif cat == "summarization":
        p = _story(r) if r.random() < 0.6 else _passage(r)
        turns = [r.choice([f"Summarize this in one sentence:\n{p}", f"Give a short summary of the following text.\n{p}",
                           f"Summarize the following in three bullet points:\n{p}"])]
    else:  # qa
        turns = [r.choice([f"What is {s}?", f"Why is {s} important?", f"Who first studied {s}?",
                           f"What are the pros and cons of {s}?", f"How do I get started learning about {s}?",
                           f"What should I pack for a trip to {r.choice(CITIES)}?",
                           f"What are some good habits for better {r.choice(['sleep', 'focus', 'health', 'writing'])}?"])]
    if cat in FOLLOW_UPS:  # a second turn, drawn last so each category's stream stays as it was
        prob, ups = FOLLOW_UPS[cat]
        if r.random() < prob:
            turns.append(ups if isinstance(ups, str) else r.choice(ups))
    return cat, turns


def generate(n: int, seed: int = 0, exclude: set[str] = frozenset(), first_id: int = 10001) -> list[dict]:
    r = random.Random(seed)
    seen, out = set(exclude), []
    tries = 0
    while len(out) < n and tries < n * 50:
        tries += 1
        cat, turns = make(r)
        if turns[0] in seen:
            continue
        seen.add(turns[0])
        out.append({"question_id": first_id + len(out), "category": cat, "turns": turns})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m scripts.prompt_templates", description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--first-id", type=int, default=10001, help="question_id of the first prompt (keep files disjoint)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--exclude", default="assets/prompts/heldout.jsonl,assets/prompts/train.jsonl",
                    help="prompt files whose first turns must not be repeated")
    a = ap.parse_args(argv)
    exclude = set()
    for path in filter(None, a.exclude.split(",")):
        exclude |= {json.loads(line)["turns"][0] for line in open(path) if line.strip()}
    rows = generate(a.n, a.seed, exclude, a.first_id)
    with open(a.out, "w") as f:
        for q in rows:
            f.write(json.dumps(q) + "\n")
    print(f"wrote {len(rows)} prompts to {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
