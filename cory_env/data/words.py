"""Word lists for the synthetic review and arithmetic corpora (plain data, no logic)."""

FILMS = (
    "movie film picture flick feature sequel remake thriller comedy drama romance documentary "
    "western musical cartoon adaptation mystery biopic satire blockbuster melodrama spoof"
).split()

ASPECTS = (
    "plot story script screenplay dialogue acting cast direction cinematography soundtrack "
    "score music editing pacing ending opening finale villain hero heroine premise twist "
    "humor writing atmosphere tone suspense animation narration photography lighting "
    "production design camerawork climax romance chemistry"
).split()

PLURAL_ASPECTS = (
    "characters performances visuals effects costumes jokes songs sets locations scenes "
    "actors stunts battles dialogues"
).split()

FIRST_NAMES = (
    "Anna Mark Julia Peter Laura David Nina Oscar Clara Victor Helen Bruno Sofia Daniel "
    "Irene Marco Lucy Henry Emma Frank Grace Simon Rita Walter"
).split()

LAST_NAMES = (
    "Reyes Carter Holm Brandt Moreau Quinn Lindqvist Okafor Sato Novak Romano Fischer "
    "Hale Duarte Kovacs Bishop Marsh Varga Lund Pryce"
).split()

ROLES = (
    "detective mother father villain soldier teacher king queen doctor scientist ghost "
    "lawyer captain nurse thief pilot farmer singer boxer spy priest journalist"
).split()

WHEN = (
    "last night", "yesterday", "on a rainy Sunday", "with my kids", "with my wife",
    "with my husband", "on television", "at the cinema", "on a long flight",
    "with some friends", "for the second time", "on opening night", "late at night",
)

FILLERS = (
    "To be honest", "In my opinion", "Frankly", "Honestly", "All in all", "Believe me",
    "I must say", "Without a doubt", "As a fan of the genre", "For what it is worth",
)

AUDIENCES = (
    "anyone", "my friends", "families", "fans of the genre", "everyone", "film students",
    "older viewers", "teenagers", "anyone who likes a good story", "my parents",
)

RELATIVES = "wife husband sister brother mother father son daughter friend girlfriend".split()

INTENSIFIERS = (
    "very really truly extremely incredibly absolutely quite remarkably so utterly "
    "thoroughly genuinely surprisingly pretty deeply simply totally"
).split()

POSITIVE = (
    "good great excellent wonderful brilliant superb amazing fantastic beautiful touching "
    "moving charming delightful hilarious funny clever witty gripping thrilling exciting "
    "engaging captivating compelling powerful stunning gorgeous magnificent marvelous "
    "splendid outstanding remarkable impressive memorable refreshing heartwarming enjoyable "
    "entertaining fun lovely sweet smart intelligent original inventive creative imaginative "
    "suspenseful convincing believable authentic natural strong solid polished elegant "
    "graceful vivid uplifting inspiring breathtaking flawless perfect terrific fabulous "
    "masterful poignant sharp fresh warm likable lively riveting sublime"
).split()

NEGATIVE = (
    "bad terrible awful horrible dreadful boring dull tedious slow predictable stupid silly "
    "pointless awkward bland lifeless weak poor lame mediocre forgettable clumsy confusing "
    "messy incoherent shallow flat wooden stiff cheesy cheap tacky annoying irritating "
    "painful unbearable unwatchable disappointing laughable ridiculous pretentious overlong "
    "bloated sloppy lazy uninspired unoriginal generic cliched tiresome depressing ugly "
    "amateurish pathetic worthless atrocious abysmal embarrassing miserable hollow dreary "
    "sluggish monotonous unconvincing forced trite stale muddled grating unfunny"
).split()

# Non-adjective words that carry sentiment in the closing sentences.
POSITIVE_EXTRA = (
    "recommend gem masterpiece joy treat delight triumph enjoy loved success cherish deep clear"
).split()
NEGATIVE_EXTRA = "waste mess disaster failure avoid regret hated".split()

# Preferred positive replacement for a negative word; others get a random positive word.
ANTONYMS = {
    "bad": "good", "terrible": "wonderful", "awful": "wonderful", "horrible": "lovely",
    "boring": "exciting", "dull": "gripping", "tedious": "engaging", "slow": "lively",
    "predictable": "original", "stupid": "smart", "silly": "clever", "weak": "strong",
    "poor": "excellent", "lame": "great", "wooden": "natural", "stiff": "natural",
    "flat": "vivid", "shallow": "deep", "confusing": "clear", "messy": "polished",
    "cheap": "polished", "forgettable": "memorable", "unfunny": "hilarious",
    "unconvincing": "convincing", "disappointing": "impressive", "lifeless": "lively",
    "ugly": "gorgeous", "depressing": "uplifting", "generic": "original", "stale": "fresh",
    "unoriginal": "original", "awkward": "graceful", "clumsy": "elegant",
    "waste": "joy", "mess": "delight", "disaster": "triumph", "failure": "success",
    "avoid": "enjoy", "regret": "cherish", "hated": "loved",
}

NEGATORS = ("not", "never", "hardly")

NAMES = (
    "Tom Anna Ben Lily Sam Mia Jack Emma Leo Zoe Max Ella Noah Ruby Omar Sara Ivan Nora "
    "Hugo Maya Raj Alice Pedro Chloe Kenji Lena Felix Ada Luis Iris"
).split()

SHE_NAMES = frozenset(
    "Anna Lily Mia Emma Zoe Ella Ruby Sara Nora Maya Alice Chloe Lena Ada Iris".split()
)

OBJECTS = (
    "apples oranges pencils marbles stickers cookies books cards toys balloons shells stamps "
    "cupcakes flowers eggs candies coins crayons beads blocks muffins pens buttons plums "
    "lemons peaches carrots shirts tickets rocks"
).split()

CONTAINERS = "bags boxes baskets jars packs trays crates bowls".split()
