"""Seeds for self-instruct prompts (eagle2_train/selfinstruct.py): topics by domain x task types x
answer formats, and two hand-written example requests per task type for the few-shot meta-prompt.

Topics avoid those of assets/prompts/heldout.jsonl (no shared topics between train and held-out;
tests/test_prompts_sources.py checks it). Programming topics read "Language: subject".
"""
from __future__ import annotations

DOMAINS: dict[str, list[str]] = {
    "home": [
        "budgeting a household", "organising a small wardrobe", "cleaning a cast-iron pan", "fixing a dripping tap",
        "meal prepping for a busy week", "composting in a small flat", "choosing a new mattress",
        "decluttering a garage", "moving house with children", "hosting a dinner party for eight",
        "caring for a new kitten", "lowering the electricity bill", "washing wool sweaters",
        "painting a bedroom", "keeping a balcony garden", "planning a surprise anniversary", "a noisy upstairs neighbour",
        "sharing chores with flatmates", "childproofing a kitchen", "choosing a family car",
    ],
    "food": [
        "baking sourdough bread", "making fresh pasta by hand", "quick vegetarian dinners", "spices in Indian cooking",
        "fermenting kimchi", "brewing pour-over coffee", "basic knife skills", "storing leftovers safely",
        "packed lunches for teenagers", "cooking rice perfectly", "a gluten-free birthday cake", "homemade pizza dough",
        "Mexican street food", "Japanese ramen broth", "making jam from summer fruit",
    ],
    "health": [
        "stretching after a run", "a bedtime routine for better rest", "drinking enough water", "posture at a desk job",
        "stress before exams", "the benefits of daily walking", "reading nutrition labels", "seasonal hay fever",
        "starting strength training at forty", "eye strain from screens", "healthy snacks for work", "a first aid kit",
        "recovering from a cold", "mindfulness meditation", "sunscreen and skin protection",
    ],
    "travel": [
        "packing light for a week away", "travelling across Europe by rail pass", "visiting Kyoto in spring",
        "backpacking South America on a budget", "a road trip around Iceland", "travel insurance", "jet lag",
        "camping with young kids", "a long layover in Singapore", "a weekend in Lisbon", "travelling with a wheelchair",
        "learning basic phrases before a trip", "staying safe while travelling alone", "a safari in Kenya",
        "visiting national parks in Utah",
    ],
    "business": [
        "a business plan for a food truck", "pricing freelance design work", "running a small online shop",
        "negotiating a salary", "handling an angry customer", "hiring a first employee", "marketing a yoga studio",
        "a quarterly budget review", "remote team meetings", "cash flow for a small cafe", "inventory for a bookshop",
        "launching a mobile app", "writing a project proposal", "a startup pitch to investors",
        "customer loyalty programmes", "a company's social media plan",
    ],
    "finance": [
        "building an emergency fund", "index funds", "improving a credit score", "paying off student loans",
        "splitting rent fairly between flatmates", "saving for a house deposit", "pensions for young workers",
        "tracking monthly spending", "buying a used car on finance", "tax returns for freelancers",
    ],
    "science": [
        "why the sky is blue", "how batteries store energy", "the life cycle of stars", "how honeybees communicate",
        "why ice floats", "how magnets work", "antibiotic resistance", "the nitrogen cycle", "how vaccines train the body",
        "CRISPR gene editing", "baking soda and vinegar reactions", "how sound travels", "how GPS finds a position",
        "the gut microbiome", "dark matter", "why leaves change colour in autumn", "how fish breathe underwater",
        "lightning", "the ozone layer", "how telescopes work", "the evolution of whales", "nuclear power plants",
        "how the eye sees colour", "the boiling point of water at altitude", "how muscles grow",
    ],
    "tech": [
        "how Wi-Fi works", "password managers", "cloud storage", "how search engines rank pages",
        "smartphone battery life", "two-factor authentication", "open-source software", "spam filters",
        "choosing a laptop for university", "backing up family photos", "3D printing", "how QR codes work",
        "self-driving cars", "smart home devices", "how streaming services recommend films",
    ],
    "humanities": [
        "the pyramids of Giza", "the Meiji Restoration", "the fall of the Berlin Wall", "the Harlem Renaissance",
        "the Magna Carta", "the invention of writing", "the ancient Olympic Games", "the Ottoman Empire",
        "the abolition of slavery", "Stoic philosophy", "utilitarianism", "the history of coffee houses",
        "Greek mythology", "the Mayan calendar", "voting systems", "the growth of cities", "the Viking age",
        "the Apollo programme", "the history of the bicycle lane", "free will", "the Cuban missile crisis",
    ],
    "arts": [
        "impressionist painting", "the structure of a sonnet", "film noir", "jazz improvisation", "street art",
        "drawing portraits", "writing a mystery novel", "composition in photography", "Shakespeare's comedies",
        "K-pop", "origami", "ballet", "Gothic cathedrals", "minimalist interior design", "starting a podcast",
        "the blues", "animated films", "learning the piano as an adult",
    ],
    "nature": [
        "migrating birds", "octopus intelligence", "tropical rainforests", "wildfires", "cacti and succulents",
        "wolves in Yellowstone", "wild mushrooms", "monarch butterflies", "humpback whales", "hedgehogs in gardens",
        "the Amazon river basin", "bats and echolocation", "urban foxes",
    ],
    "hobbies": [
        "rock climbing for beginners", "knitting a first scarf", "birdwatching", "a board game night",
        "learning to skateboard", "yoga for beginners", "freshwater fishing", "home brewing", "a fantasy book club",
        "model railways", "running a first 10k", "learning to juggle", "stargazing", "writing a journal",
    ],
    "work": [
        "studying for final exams", "learning Japanese", "writing a CV", "preparing for a job interview",
        "giving a presentation", "time management", "note-taking methods", "online courses", "a group project",
        "asking for a promotion", "a first week at a new job", "working from home", "mentoring a junior colleague",
    ],
    "programming": [
        "Python: parsing a CSV file of expenses", "Python: a class for a bank account",
        "JavaScript: fetching JSON from an API", "JavaScript: validating a sign-up form",
        "TypeScript: typing a React component's props", "SQL: joining customers and invoices",
        "SQL: finding duplicate rows", "Rust: ownership and borrowing", "Go: goroutines and channels",
        "C: reversing a linked list", "C++: a template class for a stack", "Java: binary search",
        "Java: reading a text file line by line", "Bash: renaming files in a folder", "Bash: a nightly backup script",
        "Python: unit tests with pytest", "Python: walking a directory tree", "CSS: a responsive navigation bar",
        "Kotlin: data classes", "Ruby: iterating over a hash", "PHP: handling a form submission",
        "R: plotting a histogram", "Swift: optionals", "Python: caching a slow function",
        "JavaScript: sorting an array of objects by date", "Go: a tiny HTTP server",
        "Rust: parsing command-line arguments", "SQL: running totals with window functions",
        "Python: a command-line to-do list", "C#: LINQ queries", "Python: a simple web scraper",
        "JavaScript: a countdown timer", "Python: merging two dictionaries", "Java: a simple thread pool",
    ],
    "maths": [
        "sharing pizza slices among friends", "fuel use on a road trip", "a savings account with monthly deposits",
        "a buy-two-get-one-free offer", "painting the walls of a room", "mixing paint in a ratio",
        "filling a pool with two hoses", "the ages of three siblings", "the average of test scores",
        "scaling a recipe for more guests", "tiling a kitchen floor", "fencing a rectangular garden",
        "interest on a car loan", "flight times across time zones", "coins in a piggy bank",
        "a cyclist's average speed", "drawing marbles from a bag", "the volume of a fish tank",
        "comparing two phone plans", "handshakes at a party", "stacking blocks in a staircase",
        "currency exchange on holiday", "ticket sales for a school play", "a recipe's cost per serving",
    ],
}

# how a domain's explain/compare/advice questions are labelled (MT-bench categories)
DOMAIN_CATEGORY = {"home": "qa", "food": "qa", "health": "stem", "travel": "qa", "business": "humanities",
                   "finance": "humanities", "science": "stem", "tech": "stem", "humanities": "humanities",
                   "arts": "humanities", "nature": "stem", "hobbies": "qa", "work": "qa",
                   "programming": "coding", "maths": "math"}

LANGUAGES = ["French", "Spanish", "German", "Italian", "Portuguese", "Dutch"]

EVERYDAY = ["home", "food", "health", "travel", "finance", "hobbies", "work"]
KNOWLEDGE = ["science", "tech", "humanities", "arts", "nature", "health", "finance"]
GENERAL = EVERYDAY + ["business", "science", "tech", "humanities", "arts", "nature"]

# Task types. cat None: the topic's domain decides (DOMAIN_CATEGORY). `ask` goes into the meta-prompt;
# `openers` start the assistant's reply (a request by construction; {lang}: the topic's programming
# language or a target language); `long`: the request embeds a text or code, so it needs more tokens;
# `weight` (default 1): how often the task is drawn (code and maths are what the head sees least).
TASKS: dict[str, dict] = {
    "explain": dict(
        cat=None, domains=KNOWLEDGE, long=False,
        ask="a question asking to explain something specific",
        formats=["a short paragraph", "simple words a child understands", "three bullet points", "an analogy",
                 "a step-by-step explanation"],
        openers=["Can you explain", "Explain", "How does", "Why do", "What exactly is", "I've always wondered",
                 "Could you help me understand"],
        shots=[("the northern lights", "a short paragraph",
                "What makes the northern lights appear in different colours, and why only near the poles? "
                "Please keep the answer to one short paragraph."),
               ("inflation", "simple words a child understands",
                "Can you explain why prices go up a little every year? My nine-year-old asked me and I want an "
                "answer in simple words she can follow.")]),
    "compare": dict(
        cat=None, domains=GENERAL + ["programming"], long=False,
        ask="a request to compare two or three specific things",
        formats=["a table", "pros and cons", "a short paragraph", "a bulleted list"],
        openers=["What is the difference between", "Compare", "Which is better for", "Should I choose",
                 "How do"],
        shots=[("e-readers", "a table",
                "Compare a Kindle Paperwhite and a Kobo Clara for someone who reads mostly library books. "
                "Put the differences in a table."),
               ("Python: lists and tuples", "pros and cons",
                "What is the difference between a list and a tuple in Python? Give me the pros and cons of each "
                "and say when I should use which.")]),
    "write_code": dict(
        cat="coding", domains=["programming"], long=False, weight=2,
        ask="a request for a small, concrete program",
        formats=["code with comments", "code and a short explanation", "a function with an example call",
                 "code with a few unit tests"],
        openers=["Write a {lang} function that", "Can you write a {lang} script that", "I need {lang} code that",
                 "Show me how to", "In {lang}, how do I"],
        shots=[("Python: reading JSON config files", "code with comments",
                "Write a Python function that loads settings from a JSON file, falls back to default values for "
                "missing keys, and returns a dictionary. Comment each step."),
               ("JavaScript: string formatting", "a function with an example call",
                "Can you write a JavaScript function that turns a number of seconds into a string like "
                "\"2h 05m 09s\"? Show one example call.")]),
    "debug": dict(
        cat="coding", domains=["programming"], long=True,
        ask="a bug-fix request that includes the short buggy code",
        formats=["the fixed code and an explanation", "a list of the bugs"],
        openers=["This {lang} code", "Why does this {lang} code", "Can you find the bug in this {lang} code?",
                 "My {lang} function"],
        shots=[("Python: averaging numbers", "the fixed code and an explanation",
                "My Python function should return the average of a list, but it crashes on an empty list:\n\n"
                "def average(xs):\n    return sum(xs) / len(xs)\n\nHow do I fix it so it returns 0 instead?"),
               ("JavaScript: loops and closures", "the fixed code and an explanation",
                "Why does this JavaScript code print 3 three times instead of 0, 1, 2?\n\n"
                "for (var i = 0; i < 3; i++) {\n  setTimeout(() => console.log(i), 100);\n}")]),
    "math_problem": dict(
        cat="math", domains=["maths"], long=False, weight=2,
        ask="a maths word problem with concrete numbers",
        formats=["numbered steps", "a short worked solution", "the answer with a check"],
        openers=["Solve step by step:", "A", "If", "Lena", "My", "A shop", "Please help with this problem:"],
        shots=[("the area of a patio", "numbered steps",
                "A rectangular patio is 6 m long and 4.5 m wide. Paving stones cost $18 per square metre. How much "
                "will it cost to pave the whole patio? Show the steps."),
               ("a reading challenge", "a short worked solution",
                "Omar reads 35 pages on weekdays and 60 pages on each weekend day. How many pages does he read in "
                "three weeks? Please explain your working.")]),
    "puzzle": dict(
        cat="reasoning", domains=EVERYDAY + ["maths"], long=False,
        ask="a short logic puzzle with one clear answer",
        formats=["the answer with reasoning", "a step-by-step argument"],
        openers=["Here is a puzzle:", "Three", "If", "Which", "A farmer", "Four friends"],
        shots=[("seating at a table", "the answer with reasoning",
                "Four friends sit in a row. Ana is not at either end, Ben sits right of Ana, and Cleo is at the "
                "left end. Where does Dev sit? Explain your reasoning."),
               ("weighing coins", "a step-by-step argument",
                "You have nine identical-looking coins and one is slightly heavier. With a balance scale, what is "
                "the smallest number of weighings that always finds it? Walk me through it.")]),
    "summarise": dict(
        cat="summarization", domains=GENERAL, long=True,
        ask="a request to summarise a short text, with the text",
        formats=["one sentence", "three bullet points", "a short paragraph", "a headline"],
        openers=["Summarize this", "Please summarise the following", "Can you give me a short summary of this",
                 "TL;DR this for me:"],
        shots=[("a council notice about bins", "one sentence",
                "Summarize this notice in one sentence:\n\nFrom 1 March, green garden-waste bins will be emptied "
                "every two weeks instead of weekly. Residents who need extra collections can buy a second bin for "
                "$30 a year. Collections will pause from December to February."),
               ("a product review", "three bullet points",
                "Please summarise the following review in three bullet points:\n\nI bought this kettle for my "
                "office. It boils a full litre in under three minutes and the handle stays cool. The lid is "
                "stiff to open, though, and after a month the filter came loose.")]),
    "rewrite": dict(
        cat="writing", domains=["business", "work", "home", "travel", "hobbies"], long=True,
        ask="a request to rewrite a short text, with the text",
        formats=["a more polite version", "a shorter version", "a more formal version", "a friendlier version"],
        openers=["Rewrite this", "Can you make this email sound more", "Please edit the following",
                 "Make this paragraph", "Rephrase this message so it"],
        shots=[("late delivery", "a more polite version",
                "Rewrite this message so it sounds polite but firm:\n\n\"Your parcel still hasn't arrived. This is "
                "the third time I'm writing. Sort it out.\""),
               ("volunteer call", "a shorter version",
                "Make this paragraph shorter and punchier for a flyer:\n\n\"We are currently looking for people who "
                "might be interested in volunteering some of their free time on Saturday mornings to help us keep "
                "the community garden tidy and welcoming for everyone.\"")]),
    "brainstorm": dict(
        cat="writing", domains=GENERAL, long=False,
        ask="a request for creative ideas, names or slogans",
        formats=["a numbered list", "ten short ideas", "a list with one line each"],
        openers=["Give me", "Brainstorm", "I need some ideas for", "Can you suggest", "Come up with"],
        shots=[("a school fundraiser", "ten short ideas",
                "Give me ten fundraiser ideas for a small primary school that don't involve selling sweets."),
               ("a dog-walking business", "a numbered list",
                "Brainstorm catchy names for a dog-walking business in Bristol. A numbered list is fine.")]),
    "plan": dict(
        cat="qa", domains=EVERYDAY + ["business"], long=False,
        ask="a request for a plan that states the person's constraints",
        formats=["a weekly schedule", "numbered steps", "a checklist", "a day-by-day plan"],
        openers=["Help me plan", "Can you make a plan for", "I want to", "Create a", "I have"],
        shots=[("learning to cook", "a weekly schedule",
                "I want to learn to cook five basic dinners in a month. I can practise three evenings a week. "
                "Can you make me a weekly schedule?"),
               ("a two-day trip to Edinburgh", "a day-by-day plan",
                "Help me plan two days in Edinburgh with my parents, who can't walk long distances. Give me a "
                "day-by-day plan.")]),
    "classify": dict(
        cat="extraction", domains=GENERAL, long=True,
        ask="a request to sort a given list of items",
        formats=["a table", "two groups", "a label for each item"],
        openers=["Classify the following", "Sort these", "Group these", "Which of these", "Label each of these"],
        shots=[("animals", "two groups",
                "Sort these animals into mammals and birds: bat, penguin, dolphin, ostrich, platypus, eagle."),
               ("support emails", "a label for each item",
                "Label each of these customer messages as billing, delivery or technical:\n1. I was charged twice.\n"
                "2. The app crashes when I log in.\n3. My order is a week late.")]),
    "extract": dict(
        cat="extraction", domains=GENERAL, long=True,
        ask="a request to pull facts out of a short text, with the text",
        formats=["JSON", "a table", "a bulleted list"],
        openers=["Extract", "From the text below,", "Pull out", "List all the", "Find"],
        shots=[("a job advert", "JSON",
                "Extract the job title, salary and closing date as JSON:\n\n\"Junior Data Analyst wanted at a "
                "Leeds logistics firm. Salary $32,000. Apply by 30 June with a CV and a short cover letter.\""),
               ("a meeting note", "a bulleted list",
                "From the text below, list every action item and who owns it:\n\n\"Priya will send the budget on "
                "Friday. Tom books the venue. We still need someone to order the name badges.\"")]),
    "translate": dict(
        cat="translation", domains=EVERYDAY + ["business"], long=False,
        ask="a request to translate one or two everyday sentences",
        formats=["the translation only", "the translation and notes on tricky words", "formal and informal versions"],
        # the opener starts the English source sentence too: left free, the model writes pseudo-{lang}
        openers=["Translate into {lang}: \"I would like", "Translate into {lang}: \"We are", "Translate into {lang}: \"Please",
                 "How do you say this in {lang}: \"Could you", "How do you say this in {lang}: \"Where is the",
                 "Can you translate this into {lang}? \"My friend", "What is the {lang} for \"Do you know"],
        shots=[("a hotel check-in (into Italian)", "the translation only",
                "Translate into Italian: \"We booked a double room for three nights, and we will arrive late.\""),
               ("thanking a host (into German)", "formal and informal versions",
                "How do you say this in German: \"Thank you so much for having us, the meal was wonderful.\" "
                "Give me a formal and an informal version.")]),
    "roleplay": dict(
        cat="roleplay", domains=GENERAL, long=False,
        ask="a role-play request: a character in a situation",
        formats=["a short monologue", "a dialogue", "a speech", "in character"],
        openers=["You are", "Pretend you are", "Act as", "Let's role-play:", "Imagine you are"],
        shots=[("a lighthouse keeper", "a short monologue",
                "You are a lighthouse keeper in 1890 writing in your logbook during a storm. Describe the night in "
                "a short monologue."),
               ("a job interview", "a dialogue",
                "Act as a hiring manager at a sportswear company and interview me for a sales job. Ask one question at "
                "a time.")]),
    "creative": dict(
        cat="writing", domains=GENERAL, long=False,
        ask="a creative writing request with a clear subject",
        formats=["a poem", "a short story", "an email", "a limerick", "a speech", "a blog post opening",
                 "a product description", "a letter"],
        openers=["Write a", "Compose a", "Can you write a", "I need a", "Draft a"],
        shots=[("a grandmother's garden", "a poem",
                "Write a short rhyming poem about my grandmother's vegetable garden for her 80th birthday card."),
               ("a team away-day", "an email",
                "Draft an email inviting my team of twelve to an away-day at a lake on 14 September, asking them "
                "to tell me about dietary needs.")]),
    "advice": dict(
        cat="qa", domains=EVERYDAY + ["business"], long=False,
        ask="a request for practical advice about the person's situation",
        formats=["a bulleted list", "numbered steps", "three tips", "a short paragraph"],
        openers=["How can I", "What's the best way to", "Any tips for", "I'm struggling with", "What should I do"],
        shots=[("houseplants", "a bulleted list",
                "My monstera's new leaves keep turning yellow at the edges. What could be causing this, and what "
                "should I change? Please answer with a short bulleted list."),
               ("public speaking", "three tips",
                "I have to give a toast at my brother's wedding and I get very nervous. Any tips? Three would be "
                "enough.")]),
    "discuss": dict(
        cat=None, domains=KNOWLEDGE + ["business", "work"], long=False,
        ask="a question asking for both sides of a debatable point",
        formats=["arguments for and against", "a short essay", "a balanced paragraph"],
        openers=["What are the arguments for and against", "Is it worth", "Do you think", "Should",
                 "Discuss whether"],
        shots=[("school uniforms", "arguments for and against",
                "Should secondary schools require uniforms? Give me the main arguments for and against."),
               ("four-day work week", "a balanced paragraph",
                "Is a four-day work week good for small businesses? Write a balanced paragraph.")]),
    "quiz": dict(
        cat=None, domains=KNOWLEDGE + ["hobbies"], long=False,
        ask="a request to create quiz or study questions",
        formats=["five multiple-choice questions", "ten flashcards", "a short quiz with answers"],
        openers=["Make", "Write", "Create a quiz about", "Can you quiz me on", "Give me"],
        shots=[("the solar system", "five multiple-choice questions",
                "Make five multiple-choice questions about the planets of the solar system for a class of "
                "eleven-year-olds, with the answers at the end."),
               ("Spanish verbs", "ten flashcards",
                "Give me ten flashcards to practise Spanish verbs in the past tense.")]),
}

# The meta-prompt's system turn (short: every token of it is prefilled for every job).
SYSTEM = "You write messages that people send to an AI assistant. Write only the message, never an answer."
